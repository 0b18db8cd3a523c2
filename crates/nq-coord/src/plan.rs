//! Turning a board into jobs: the split, the work estimates, and grouping.
//!
//! A job is a run of consecutive sub-problems (in the split's order) whose
//! estimated work adds up to about `total / target_jobs`. Grouping keeps the
//! number of RPCs sensible at large N, where there are far more sub-problems
//! than useful jobs; at small N the target makes a few hundred jobs so the
//! work still balances over many threads.

use nq_core::Board;
use nq_core::split::{SplitSpec, SubProblem, split};
use nq_store::NewJob;

/// The most sub-problems in one job. Keeps every job message far below
/// `nq_proto::MAX_MESSAGE_BYTES` (a sub-problem costs about N + 2 bytes on
/// the wire, its result about 40), even when a worker leases many at once.
pub const MAX_SUBS_PER_JOB: usize = 4096;

/// [`Plan::into_jobs`] frees the sub-problems it has used after this many.
const RELEASE_EVERY: usize = 1 << 18;

/// Below this many sub-problems the estimates run on one thread; above it they
/// are spread over every core (N = 22 with split 1:2 has 2.8 million, at
/// about 7 µs each).
const PARALLEL_ESTIMATES: usize = 50_000;

/// The sub-problems of a run and their estimated work, in split order.
#[derive(Debug)]
pub(crate) struct Plan {
    board: Board,
    subs: Vec<SubProblem>,
    works: Vec<u64>,
}

impl Plan {
    /// Splits `board` and estimates every sub-problem.
    pub(crate) fn new(board: Board, spec: SplitSpec) -> Plan {
        let subs = split(board, spec);
        let works = estimate_all(&subs, PARALLEL_ESTIMATES);
        Plan { board, subs, works }
    }

    /// Number of sub-problems.
    pub(crate) fn subproblems(&self) -> usize {
        self.subs.len()
    }

    /// The jobs, grouped for about `target_jobs` jobs of at most `max_size`
    /// sub-problems each (1 to [`MAX_SUBS_PER_JOB`]); one job per
    /// sub-problem when `target_jobs` is at least their number.
    ///
    /// Lazy and consuming: the sub-problems already turned into jobs are
    /// freed as it goes (every [`RELEASE_EVERY`] sub-problems), so that the
    /// split's memory shrinks while the store's grows and a million-job run
    /// is created within the coordinator's memory budget.
    pub(crate) fn into_jobs(
        self,
        target_jobs: u64,
        max_size: usize,
    ) -> impl Iterator<Item = NewJob> {
        self.into_jobs_releasing(target_jobs, max_size, RELEASE_EVERY)
    }

    fn into_jobs_releasing(
        self,
        target_jobs: u64,
        max_size: usize,
        release_every: usize,
    ) -> impl Iterator<Item = NewJob> {
        let Plan {
            board,
            mut subs,
            mut works,
        } = self;
        // A target of at least one job per sub-problem means exactly that.
        let max_size = if target_jobs >= subs.len() as u64 {
            1
        } else {
            max_size.clamp(1, MAX_SUBS_PER_JOB)
        };
        let total: u128 = works.iter().map(|&w| u128::from(w)).sum();
        let target = total.div_ceil(u128::from(target_jobs.max(1))).max(1);
        let n = board.len();
        let mut next = 0;
        std::iter::from_fn(move || {
            if next >= release_every {
                // Shifts what is left to the front (a few hundred MB of
                // copying over a whole million-job creation) and gives the
                // freed tail back to the allocator.
                subs.drain(..next);
                works.drain(..next);
                subs.shrink_to_fit();
                works.shrink_to_fit();
                next = 0;
            }
            if next == subs.len() {
                return None;
            }
            let mut rows = Vec::with_capacity(4 * n);
            let mut work = 0u128;
            let mut count = 0;
            // Close the job before the sub-problem that would take it past the
            // target (a sub-problem larger than the target is a job alone).
            while next < subs.len() && count < max_size {
                let w = u128::from(works[next]);
                if count > 0 && work + w > target {
                    break;
                }
                rows.extend_from_slice(subs[next].prefix().rows());
                work += w;
                next += 1;
                count += 1;
            }
            Some(NewJob {
                rows,
                work: u64::try_from(work).unwrap_or(u64::MAX),
            })
        })
    }
}

/// `SubProblem::estimate` of every sub-problem, in order; on every core when
/// there are at least `parallel_from`.
fn estimate_all(subs: &[SubProblem], parallel_from: usize) -> Vec<u64> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if subs.len() < parallel_from || threads == 1 {
        return subs.iter().map(SubProblem::estimate).collect();
    }
    // Each thread fills its own part of one vector: no per-thread copies, so a
    // split of millions of sub-problems needs the 8 bytes per estimate once.
    let mut works = vec![0u64; subs.len()];
    let per = subs.len().div_ceil(threads);
    std::thread::scope(|scope| {
        for (part, out) in subs.chunks(per).zip(works.chunks_mut(per)) {
            scope.spawn(move || {
                for (sub, w) in part.iter().zip(out) {
                    *w = sub.estimate();
                }
            });
        }
    });
    works
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_cover_every_subproblem_once_in_order() {
        let board = Board::new(10).unwrap();
        let spec = SplitSpec::new(1, 1).unwrap();
        let plan = || Plan::new(board, spec);
        let works: Vec<u64> = plan().works;
        for target in [1, 7, 50, 1_000_000] {
            let jobs: Vec<NewJob> = plan().into_jobs(target, MAX_SUBS_PER_JOB).collect();
            let rows: Vec<u8> = jobs.iter().flat_map(|j| j.rows.clone()).collect();
            let want: Vec<u8> = split(board, spec)
                .iter()
                .flat_map(|s| s.prefix().rows().to_vec())
                .collect();
            assert_eq!(rows, want, "target {target}");
            // Greedy grouping makes at most about twice the target.
            assert!(jobs.len() as u64 <= 2 * target + 1, "{} jobs", jobs.len());
            let work: u128 = jobs.iter().map(|j| u128::from(j.work)).sum();
            assert_eq!(work, works.iter().map(|&w| u128::from(w)).sum::<u128>());
        }
        let n = plan().subproblems();
        assert_eq!(plan().into_jobs(n as u64, MAX_SUBS_PER_JOB).count(), n);
        assert!(plan().into_jobs(n as u64 - 1, MAX_SUBS_PER_JOB).count() < n);
        assert_eq!(plan().into_jobs(1, 1).count(), n);
        assert!(plan().into_jobs(1, 3).all(|j| j.rows.len() <= 3 * 10));
        assert_eq!(plan().into_jobs(1, MAX_SUBS_PER_JOB).count(), 1);
    }

    #[test]
    fn jobs_survive_the_release_of_used_subproblems() {
        // Releasing every 1000 sub-problems, with jobs of one and of several:
        // every prefix must still come out once, in order.
        let board = Board::new(12).unwrap();
        let spec = SplitSpec::new(1, 2).unwrap();
        let want: Vec<Vec<u8>> = split(board, spec)
            .iter()
            .map(|s| s.prefix().rows().to_vec())
            .collect();
        assert!(want.len() > 3000, "{}", want.len());
        for size in [1, 7] {
            let got: Vec<u8> = Plan::new(board, spec)
                .into_jobs_releasing(1, size, 1000)
                .flat_map(|j| j.rows)
                .collect();
            assert!(got == want.concat(), "size {size}");
        }
    }

    #[test]
    fn parallel_estimates_match_serial_ones() {
        let board = Board::new(11).unwrap();
        let subs = split(board, SplitSpec::new(1, 2).unwrap());
        let serial: Vec<u64> = subs.iter().map(SubProblem::estimate).collect();
        assert_eq!(estimate_all(&subs, 0), serial);
    }
}
