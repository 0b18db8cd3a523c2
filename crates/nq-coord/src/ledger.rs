//! The checked path every result takes, remote or local: verify, then commit.
//!
//! 1. [`verify`] checks a report against the stored job: one `SubCounts` per
//!    sub-problem, each passing `SubProblem::check`, and in solutions mode as
//!    many valid, ordered solutions per sub-problem as its count says. It folds
//!    the counts into the job's [`Tally`].
//! 2. [`Session::commit`](crate::session::Session::commit) queues the verified
//!    result for the [`committer`], ONE task that owns every write of results.
//!    It takes all the results queued while the previous flush ran, decides
//!    each one (first result → accepted; repeat → compared with the stored
//!    result, a confirmation or a conflict), applies them, flushes ONCE, and
//!    only then updates the scheduler and acknowledges. That is group commit:
//!    one disk sync per batch instead of per result.
//!
//! Because the committer is the only writer of results and decides in queue
//! order, two reports of one job can never both be accepted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use nq_core::split::{SubCounts, SubProblem, Tally};
use nq_store::{CommitBatch, Duplicate, DuplicateKind, JobId, StoredResult};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info};

use crate::error::{Error, ReportFault, Result};
use crate::lease::LeaseId;
use crate::scheduler::Outcome;
use crate::session::Session;

/// Most results applied under one flush.
const MAX_GROUP: usize = 2048;

/// A report as received, before checking.
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) job: JobId,
    pub(crate) lease: LeaseId,
    pub(crate) worker: String,
    pub(crate) counts: Vec<SubCounts>,
    pub(crate) nodes: u64,
    /// `solutions_sent` of the result chunk.
    pub(crate) solutions_sent: u64,
    /// Solutions received per sub-problem (solutions mode), from the
    /// [`SolutionWriter`].
    pub(crate) listed: Option<Vec<u64>>,
}

/// A report that passed every check, with its contribution to the totals.
#[derive(Debug)]
pub(crate) struct Verified {
    pub(crate) job: JobId,
    pub(crate) lease: LeaseId,
    pub(crate) result: StoredResult,
}

/// A verified result waiting for the committer, with where to send the
/// outcome.
#[derive(Debug)]
pub(crate) struct CommitRequest {
    pub(crate) verified: Verified,
    /// Answered after the flush that covers the result.
    pub(crate) reply: oneshot::Sender<Result<Outcome>>,
}

/// Checks a report of the job whose sub-problems are `subs`.
///
/// # Errors
///
/// [`Error::BadReport`] naming the fault, and the errors of
/// [`Scheduler::check_report`](crate::scheduler::Scheduler::check_report).
pub(crate) fn verify(
    session: &Session,
    subs: &[SubProblem],
    report: Report,
) -> Result<Verified> {
    let job = report.job;
    let bad = |fault| Error::BadReport { job, fault };
    session.sched().check_report(job, report.lease)?;
    if report.counts.len() != subs.len() {
        return Err(bad(ReportFault::CountsLength {
            expected: subs.len(),
            found: report.counts.len(),
        }));
    }
    let spec = session.shape.spec;
    let mut tally = Tally::default();
    for (i, (sub, counts)) in subs.iter().zip(&report.counts).enumerate() {
        sub.check(spec, counts)
            .and_then(|()| tally.add(sub, counts))
            .map_err(|source| bad(ReportFault::Counts { sub: i, source }))?;
    }
    let solutions = match (&report.listed, session.shape.solutions) {
        (Some(listed), true) => {
            let received: u64 = listed.iter().sum();
            if received != report.solutions_sent {
                return Err(bad(ReportFault::SolutionsSent {
                    sent: report.solutions_sent,
                    received,
                }));
            }
            for (i, (&l, c)) in listed.iter().zip(&report.counts).enumerate() {
                if u128::from(l) != c.count {
                    return Err(bad(ReportFault::SolutionCount {
                        sub: i,
                        listed: l,
                        count: c.count,
                    }));
                }
            }
            received
        }
        (None, true) => {
            return Err(bad(ReportFault::SolutionsSent {
                sent: report.solutions_sent,
                received: 0,
            }));
        }
        (_, false) => {
            if report.solutions_sent != 0 {
                return Err(bad(ReportFault::SolutionsNotWanted));
            }
            0
        }
    };
    Ok(Verified {
        job,
        lease: report.lease,
        result: StoredResult {
            counts: report.counts,
            solutions,
            tally,
            nodes: report.nodes,
            worker: report.worker,
            lease: report.lease.0,
        },
    })
}

/// The committer task: group-commits verified results until `token` is
/// cancelled, then drains what is queued and returns.
///
/// # Errors
///
/// A store error (a failed write or flush). It is fatal: acknowledged results
/// must be durable, and a store that cannot flush cannot promise that. Every
/// queued reporter then gets [`Error::ShuttingDown`] and retries later.
pub(crate) async fn committer(
    session: Arc<Session>,
    mut rx: mpsc::Receiver<CommitRequest>,
    token: CancellationToken,
) -> Result<()> {
    let mut group = Vec::with_capacity(MAX_GROUP);
    loop {
        let received = tokio::select! {
            biased;
            n = rx.recv_many(&mut group, MAX_GROUP) => n,
            () = token.cancelled() => {
                // No new results; finish those already queued.
                rx.close();
                rx.recv_many(&mut group, MAX_GROUP).await
            }
        };
        if received == 0 {
            return Ok(());
        }
        if let Err(e) = commit_group(&session, &mut group).await {
            error!(error = %e.chain(), "cannot store results; stopping the coordinator");
            rx.close();
            return Err(e);
        }
    }
}

/// Decides, writes, flushes, applies and acknowledges one group.
async fn commit_group(session: &Session, group: &mut Vec<CommitRequest>) -> Result<()> {
    // 1. Decide. Only this task changes done-ness, so what it reads now still
    // holds after the flush.
    let done: Vec<(bool, u32)> = {
        let s = session.sched();
        group
            .iter()
            .map(|r| (s.is_done(r.verified.job), s.attempts(r.verified.job)))
            .collect()
    };
    let mut first_here: HashMap<JobId, usize> = HashMap::new();
    let mut decisions = Vec::with_capacity(group.len());
    let mut batch = CommitBatch::new();
    for (i, req) in group.iter().enumerate() {
        let v = &req.verified;
        let (was_done, attempts) = done[i];
        if !was_done && !first_here.contains_key(&v.job) {
            first_here.insert(v.job, i);
            batch.result(v.job, v.result.clone(), attempts);
            decisions.push(Outcome::Accepted);
            continue;
        }
        let agrees = match first_here.get(&v.job) {
            Some(&j) => group[j].verified.result.agrees(&v.result),
            None => match session.store.result(v.job)? {
                Some(stored) => stored.agrees(&v.result),
                // The scheduler says done but the store has no result: only a
                // damaged store can do that. Treat as a disagreement (recorded,
                // not counted).
                None => false,
            },
        };
        let kind = if agrees {
            DuplicateKind::Confirmation
        } else {
            DuplicateKind::Conflict
        };
        batch.duplicate(
            v.job,
            &Duplicate {
                kind,
                result: v.result.clone(),
            },
        );
        decisions.push(if agrees {
            Outcome::Confirmed
        } else {
            Outcome::Conflict
        });
    }
    // 2. Write and make durable, before anything is acknowledged.
    session.store.apply(batch)?;
    session.store.flush_async().await?;
    // 3. Apply to the scheduler.
    let mut outcomes = Vec::with_capacity(group.len());
    let complete = {
        let mut s = session.sched();
        for (req, &decided) in group.iter().zip(&decisions) {
            let v = &req.verified;
            let agrees = decided == Outcome::Confirmed;
            let outcome = s.complete(v.job, v.lease, &v.result.tally, || agrees);
            debug_assert!(!matches!(&outcome, Ok(o) if *o != decided));
            outcomes.push(outcome);
        }
        s.is_complete()
    };
    // 4. Acknowledge.
    for (req, outcome) in group.drain(..).zip(outcomes) {
        let v = &req.verified;
        match &outcome {
            Ok(Outcome::Accepted) => {
                debug!(job = %v.job, lease = %v.lease, worker = %v.result.worker, "job done")
            }
            Ok(Outcome::Confirmed) => {
                info!(job = %v.job, lease = %v.lease, worker = %v.result.worker, "repeated result confirms the stored one")
            }
            Ok(Outcome::Conflict) => error!(
                job = %v.job,
                lease = %v.lease,
                worker = %v.result.worker,
                "CONFLICT: a repeated result disagrees with the stored one; recorded, not counted"
            ),
            Err(e) => {
                error!(job = %v.job, error = %e.chain(), "cannot apply a stored result")
            }
        }
        // A reporter that gave up waiting is not an error.
        let _ = req.reply.send(outcome);
    }
    if complete {
        session.complete.cancel();
    }
    Ok(())
}

/// Receives the solutions of one report (or one local job) in solutions mode:
/// checks each, counts them per sub-problem, and stores them unless the job is
/// already done.
///
/// A writer holds the job's claim (`Session::claims`) from `open` until it is
/// dropped, which the caller does only after the result is committed. While
/// a claim is held, no other report of the job may write solutions (it gets
/// [`Error::Busy`] and retries), so the stored solutions of a done job are
/// exactly those of its accepted report. Leftovers of a report that died
/// midway are deleted when the next writer opens.
#[derive(Debug)]
pub(crate) struct SolutionWriter {
    session: Arc<Session>,
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
        session: &Arc<Session>,
        job: JobId,
        subs: &[SubProblem],
    ) -> Result<SolutionWriter> {
        let write = !session.sched().is_done(job);
        if write {
            let mut claims = session
                .claims
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !claims.insert(job) {
                return Err(Error::Busy { job });
            }
        }
        let writer = SolutionWriter {
            session: Arc::clone(session),
            job,
            write,
            n: session.shape.board.len(),
            subs: subs.to_vec(),
            listing: Mutex::new((0..subs.len()).map(|_| Listing::default()).collect()),
        };
        if write {
            // Dropping `writer` on error releases the claim.
            let cleared = session.store.clear_solutions(job)?;
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
            self.session
                .store
                .put_solutions(job, sub, l.batches, rows)?;
        }
        l.batches += 1;
        Ok(())
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
            let mut claims = self
                .session
                .claims
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            claims.remove(&self.job);
        }
    }
}
