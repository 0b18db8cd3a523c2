//! Solutions mode: the one writer of a job's solutions at a time.

use std::sync::{Arc, Mutex, PoisonError};

use nq_core::split::SubProblem;
use nq_store::JobId;
use tracing::debug;

use super::Engine;
use crate::error::{Error, ReportFault, Result};

/// Receives the solutions of one report (or one local job) in solutions mode:
/// checks each, counts them per sub-problem, and stores them unless the job is
/// already done.
///
/// A writer holds the job's claim ([`crate::core::Core::claim`]) from `open` until it is
/// dropped, which the caller does only after the result is committed. While
/// a claim is held, no other report of the job may write solutions (it gets
/// [`Error::Busy`] and retries), so the stored solutions of a done job are
/// exactly those of its accepted report. Leftovers of a report that died
/// midway are deleted when the next writer opens.
#[derive(Debug)]
pub(crate) struct SolutionWriter {
    engine: Arc<Engine>,
    job: JobId,
    /// False when the job was already done at `open`: solutions are checked and
    /// counted (for the comparison) but not stored.
    write: bool,
    n: usize,
    /// The job's sub-problems, to check solutions against.
    subs: Vec<SubProblem>,
    /// Per sub-problem: batches stored, solutions received, last solution.
    listing: Mutex<Vec<Listing>>,
}

#[derive(Debug, Default)]
struct Listing {
    batches: u32,
    solutions: u64,
    last: Vec<u8>,
}

impl SolutionWriter {
    /// Opens a writer for `job`, whose sub-problems are `subs`.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when another report of the job is writing; store errors.
    pub(crate) fn open(
        engine: &Arc<Engine>,
        job: JobId,
        subs: &[SubProblem],
    ) -> Result<SolutionWriter> {
        // Only the copy that is counted first stores its solutions; checks
        // are verified and counted, not stored (unless verification
        // overturned the copy whose solutions were stored).
        let write = {
            let mut core = engine.core();
            let write = core.job(job).wants_solutions();
            if write && !core.claim(job) {
                return Err(Error::Busy { job });
            }
            write
        };
        let writer = SolutionWriter {
            engine: Arc::clone(engine),
            job,
            write,
            n: engine.shape.board.len(),
            subs: subs.to_vec(),
            listing: Mutex::new((0..subs.len()).map(|_| Listing::default()).collect()),
        };
        if write {
            // Dropping `writer` on error releases the claim.
            let cleared = engine.store.clear_solutions(job)?;
            if cleared > 0 {
                debug!(job = %job, batches = cleared, "deleted solutions of an unfinished report");
            }
        }
        Ok(writer)
    }

    /// Takes one batch of solutions of sub-problem `sub`.
    ///
    /// # Errors
    ///
    /// [`Error::BadReport`] when the batch is malformed or a placement is not
    /// a solution of the sub-problem, or solutions are out of order; store
    /// errors.
    pub(crate) fn batch(&self, sub: u32, rows: &[u8]) -> Result<()> {
        let job = self.job;
        let bad = |fault| Error::BadReport { job, fault };
        let i = sub as usize;
        let subproblem = self.subs.get(i).ok_or(bad(ReportFault::SubIndex {
            sub,
            subs: self.subs.len(),
        }))?;
        if rows.is_empty() || !rows.len().is_multiple_of(self.n) {
            return Err(bad(ReportFault::BatchLength {
                len: rows.len(),
                n: self.n,
            }));
        }
        let mut listing = self.listing.lock().unwrap_or_else(PoisonError::into_inner);
        let l = &mut listing[i];
        let mut last: &[u8] = &l.last;
        for s in rows.chunks_exact(self.n) {
            if !subproblem.is_completion(s) {
                return Err(bad(ReportFault::NotASolution { sub: i }));
            }
            // The search lists in increasing order, so a repeat is a fault.
            if !last.is_empty() && s <= last {
                return Err(bad(ReportFault::Unordered { sub: i }));
            }
            last = s;
        }
        let count = (rows.len() / self.n) as u64;
        l.last = last.to_vec();
        l.solutions += count;
        if self.write {
            self.engine.store.put_solutions(job, sub, l.batches, rows)?;
        }
        l.batches += 1;
        Ok(())
    }

    /// True when this writer stores the solutions it receives.
    pub(crate) fn stores(&self) -> bool {
        self.write
    }

    /// Solutions received so far, per sub-problem.
    pub(crate) fn listed(&self) -> Vec<u64> {
        let listing = self.listing.lock().unwrap_or_else(PoisonError::into_inner);
        listing.iter().map(|l| l.solutions).collect()
    }
}

impl Drop for SolutionWriter {
    fn drop(&mut self) {
        if self.write {
            self.engine.core().release_claim(self.job);
        }
    }
}
