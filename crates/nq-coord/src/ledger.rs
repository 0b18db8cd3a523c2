//! The checked path every result takes, remote or local: admit, check,
//! judge, commit.
//!
//! 1. Admission ([`Scheduler::check_report`](crate::scheduler::Scheduler::check_report),
//!    called by the service before it reads a stream): the report is bound to
//!    a lease this session issued, to its worker, for its job, in this run.
//! 2. [`verify`] checks a report against the stored job: one `SubCounts` per
//!    sub-problem, each passing `SubProblem::check` (invariants and bounds),
//!    and in solutions mode as many valid, ordered solutions per sub-problem
//!    as its count says. It folds the counts into the copy's [`Tally`].
//! 3. [`Session::commit`](crate::session::Session::commit) queues the checked
//!    copy for the [`committer`], ONE task that owns every write of results.
//!    It judges each copy with the job's stored copies by the rules of
//!    [`crate::quorum`] (settled or another copy wanted, which copy counts,
//!    who lost a conflict), writes, flushes ONCE for the whole group, and
//!    only then updates the scheduler and acknowledges. That is group commit:
//!    one disk sync per batch instead of per result.
//! 4. A copy that discredits a worker (its first lost conflict, or its ban)
//!    makes the committer judge again every job that worker voted for, so
//!    none of its unverified results stays counted without a second vote.
//!
//! Because the committer is the only writer of results and decides in queue
//! order, no copy is ever counted twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use nq_core::split::{SubCounts, SubProblem, Tally};
use nq_store::{CommitBatch, Duplicate, DuplicateKind, JobId, JobState, StoredResult};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::error::{Error, ReportFault, Result};
use crate::lease::LeaseId;
use crate::quorum::{Vote, judge};
use crate::scheduler::{Fallout, Issued, Outcome, Scheduler, Settlement};
use crate::session::{Session, blocking, unix_ms};

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
    /// The job's estimated work (from its stored definition, which the
    /// caller read to check the report).
    pub(crate) work: u64,
    /// `solutions_sent` of the result chunk.
    pub(crate) solutions_sent: u64,
    /// Solutions received per sub-problem (solutions mode), from the
    /// [`SolutionWriter`].
    pub(crate) listed: Option<Vec<u64>>,
    /// The kernel that counted, as reported.
    pub(crate) kernel: String,
    /// The lease as issued (from admission).
    pub(crate) issued: Issued,
    /// Solutions mode: true when this report's solutions were stored (see
    /// [`SolutionWriter`]).
    pub(crate) stored_solutions: bool,
}

/// A report that passed every check, with its contribution to the totals.
#[derive(Debug)]
pub(crate) struct Verified {
    pub(crate) job: JobId,
    pub(crate) lease: LeaseId,
    /// Solutions mode: true when its solutions are the stored ones.
    pub(crate) stored_solutions: bool,
    /// The job's estimated work.
    pub(crate) work: u64,
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
    // A job's copies must agree with the published total where one is
    // known: no single job can hold more solutions than the whole board.
    if let Some((total, _)) = nq_core::published::published(session.shape.board.n())
        && tally.total > total
    {
        return Err(bad(ReportFault::AbovePublished {
            total: tally.total,
            published: total,
        }));
    }
    let identity = session
        .sched()
        .identities()
        .name(report.issued.identity)
        .to_owned();
    Ok(Verified {
        job,
        lease: report.lease,
        stored_solutions: report.stored_solutions,
        work: report.work,
        result: StoredResult {
            counts: report.counts,
            solutions,
            tally,
            nodes: report.nodes,
            worker: report.worker,
            lease: report.lease.0,
            identity,
            kernel: report.kernel,
            received_unix_ms: unix_ms(std::time::SystemTime::now()),
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
            () = session.machines_changed.notified(), if !session.complete.is_cancelled() => {
                let changed = Fallout {
                    selection_changed: true,
                    ..Fallout::default()
                };
                if let Err(e) = rejudge(&session, changed).await {
                    error!(error = %e.chain(), "cannot store results; stopping the coordinator");
                    rx.close();
                    return Err(e);
                }
                if session.sched().is_complete() {
                    session.complete.cancel();
                }
                continue;
            }
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

/// The copies of one job as the committer sees them while it decides a
/// group: the stored ones, then those decided earlier in the group.
#[derive(Debug)]
struct JobCopies {
    /// Every copy, in the order received; the Done record's copy first.
    copies: Vec<StoredResult>,
    /// Which copy the job's Done record holds.
    done: Option<usize>,
    /// The tally the scheduler counts for the job (after the decisions so
    /// far in this group).
    counted: Option<Tally>,
    /// True when the job was settled before this group.
    settled: bool,
    attempts: u32,
    /// The job's estimated work.
    work: u64,
    /// Solutions mode: the copy whose solutions are stored, if any.
    stored: Option<usize>,
}

impl JobCopies {
    /// Reads the stored copies of `job`, whose estimated work is `work`.
    fn load(session: &Session, job: JobId, work: u64) -> Result<JobCopies> {
        let record = session.store.job_record(job)?;
        let mut copies = Vec::new();
        let mut done = None;
        if let JobState::Done(result) = record.state {
            copies.push(*result);
            done = Some(0);
            copies.extend(
                session
                    .store
                    .job_duplicates(job)?
                    .into_iter()
                    .map(|d| d.result),
            );
        }
        let (counted, settled, missing) = {
            let s = session.sched();
            (s.is_counted(job), s.is_done(job), s.wants_solutions(job))
        };
        let counted = match (counted, done) {
            (true, Some(i)) => Some(copies[i].tally),
            _ => None,
        };
        Ok(JobCopies {
            copies,
            stored: if missing { None } else { done },
            done,
            counted,
            settled,
            attempts: record.attempts,
            work,
        })
    }
}

/// What judging a job's copies decided: the writes go into the group's
/// batch, the settlement to the scheduler after the flush.
struct Decision {
    settlement: Settlement,
    /// The outcome for the copy that was judged (if one was).
    outcome: Outcome,
}

/// Judges `job`'s copies, the newest being `new` (or none, to judge again
/// after a change of reputations), and adds the writes to `batch`.
fn decide(
    sched: &mut Scheduler,
    job: JobId,
    jc: &mut JobCopies,
    new: Option<&Verified>,
    batch: &mut CommitBatch,
    solutions_mode: bool,
) -> Decision {
    let old_done = jc.done;
    if let Some(v) = new {
        jc.copies.push(v.result.clone());
        if v.stored_solutions {
            jc.stored = Some(jc.copies.len() - 1);
        }
    }
    // Classes of equal results, numbered in order of first appearance.
    let mut reps: Vec<usize> = Vec::new();
    let mut votes = Vec::with_capacity(jc.copies.len());
    for (i, c) in jc.copies.iter().enumerate() {
        let class = match reps.iter().position(|&r| jc.copies[r].agrees(c)) {
            Some(k) => k,
            None => {
                reps.push(i);
                reps.len() - 1
            }
        };
        votes.push(Vote {
            identity: sched.intern(&c.identity),
            class,
        });
    }
    let ban_after = sched.policy().ban_after;
    let verdict = judge(
        &votes,
        sched.selected(job),
        sched.identities(),
        sched.rules(),
    );
    // The copy the Done record should hold: the leader's first voting copy,
    // or in solutions mode the leader's copy whose solutions are stored.
    let stored_leads = jc
        .stored
        .filter(|&s| verdict.leader == Some(votes[s].class));
    let leader_copy = stored_leads.or_else(|| {
        verdict.leader.map(|l| {
            (0..jc.copies.len())
                .find(|&i| {
                    votes[i].class == l
                        && !sched.identities().is_banned(votes[i].identity, ban_after)
                })
                .unwrap_or(reps[l])
        })
    });
    // Solutions mode: the stored solutions must be the counted copy's; when
    // the majority overturned the copy that stored them, the next copy stores
    // its own (its writer deletes the stale ones first).
    let solutions_missing =
        solutions_mode && verdict.leader.is_some() && stored_leads.is_none();
    let newest = jc.copies.len() - 1;
    match (old_done, leader_copy) {
        (None, _) => {
            // The job's first copy (whatever its vote): it becomes the record.
            let first = leader_copy.unwrap_or(newest);
            batch.result(job, jc.copies[first].clone(), jc.attempts);
            jc.done = Some(first);
        }
        (Some(d), Some(l))
            if d != l
                && (votes[d].class != votes[l].class || stored_leads == Some(l)) =>
        {
            // Verification overturned the recorded copy.
            batch.replace_result(job, jc.copies[l].clone(), jc.attempts);
            keep_copy(batch, job, &jc.copies[d], false);
            jc.done = Some(l);
            if new.is_some() && l != newest {
                let agrees = votes[newest].class == votes[l].class;
                keep_copy(batch, job, &jc.copies[newest], agrees);
            }
        }
        (Some(d), _) => {
            if new.is_some() {
                let agrees = votes[newest].class == votes[d].class;
                keep_copy(batch, job, &jc.copies[newest], agrees);
            }
        }
    }
    let counted = leader_copy.map(|l| jc.copies[l].tally);
    let outcome = match (old_done, verdict.leader) {
        (None, _) => Outcome::Accepted,
        (Some(_), Some(l)) if votes[newest].class == l => {
            if jc.done != old_done {
                Outcome::Accepted
            } else {
                Outcome::Confirmed
            }
        }
        _ => Outcome::Conflict,
    };
    // Losses are charged when a disputed job settles, once.
    let losers = if verdict.settled && !jc.settled {
        verdict.losers.clone()
    } else {
        vec![]
    };
    let settlement = Settlement {
        job,
        lease: new.map(|v| v.lease),
        counted_before: jc.counted,
        counted,
        work: jc.work,
        attempts: jc.attempts,
        votes: verdict.votes,
        settled: verdict.settled && !solutions_missing,
        // A copy that only has to store the leader's solutions may come from
        // one of the leader's voters (it adds no vote).
        reporters: if solutions_missing {
            let leader = verdict.leader;
            verdict
                .reporters
                .iter()
                .copied()
                .filter(|r| {
                    !votes
                        .iter()
                        .any(|v| v.identity == *r && Some(v.class) == leader)
                })
                .collect()
        } else {
            verdict.reporters
        },
        kernels: {
            let mut k: Vec<String> = jc.copies.iter().map(|c| c.kernel.clone()).collect();
            k.sort_unstable();
            k.dedup();
            k
        },
        losers,
        disputed: verdict.conflict,
        solutions_missing,
        confirmed: verdict.confirmed,
        unchecked: verdict.unchecked,
    };
    jc.counted = counted;
    jc.settled = settlement.settled;
    Decision {
        settlement,
        outcome,
    }
}

/// Records a copy of `job` that is not the recorded one, as evidence: a
/// confirmation when it `agrees` with the recorded copy, else a conflict.
fn keep_copy(batch: &mut CommitBatch, job: JobId, copy: &StoredResult, agrees: bool) {
    let kind = if agrees {
        DuplicateKind::Confirmation
    } else {
        DuplicateKind::Conflict
    };
    batch.duplicate(
        job,
        &Duplicate {
            kind,
            result: copy.clone(),
        },
    );
}

/// Decides, writes, flushes, applies and acknowledges one group.
async fn commit_group(session: &Session, group: &mut Vec<CommitRequest>) -> Result<()> {
    if session.complete.is_cancelled() {
        return keep_late_copies(session, group).await;
    }
    // 1. Decide, in queue order. Only this task changes results, so what it
    // reads now still holds after the flush.
    let mut overlay: HashMap<JobId, JobCopies> = HashMap::new();
    let mut decisions = Vec::with_capacity(group.len());
    let mut batch = CommitBatch::new();
    blocking(|| -> Result<()> {
        for req in group.iter() {
            let v = &req.verified;
            let jc = match overlay.entry(v.job) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(JobCopies::load(session, v.job, v.work)?)
                }
            };
            let mut s = session.sched();
            decisions.push(decide(
                &mut s,
                v.job,
                jc,
                Some(v),
                &mut batch,
                session.shape.solutions,
            ));
        }
        Ok(())
    })?;
    // 2. Write and make durable, before anything is acknowledged.
    apply_and_flush(session, batch).await?;
    // 3. Apply to the scheduler.
    let mut outcomes = Vec::with_capacity(group.len());
    let mut fallout = Fallout::default();
    {
        let mut s = session.sched();
        for d in &decisions {
            let f = s.settle(&d.settlement, true);
            if let Ok(f) = &f {
                s.note_outcome(d.outcome);
                fallout.discredited.extend(&f.discredited);
                fallout.selection_changed |= f.selection_changed;
            }
            outcomes.push(f.map(|_| d.outcome));
        }
    }
    // 4. Acknowledge.
    for (req, outcome) in group.drain(..).zip(outcomes) {
        let v = &req.verified;
        match &outcome {
            Ok(Outcome::Accepted) => {
                debug!(job = %v.job, lease = %v.lease, worker = %v.result.identity, "copy counts")
            }
            Ok(Outcome::Confirmed) => {
                debug!(job = %v.job, lease = %v.lease, worker = %v.result.identity, "copy confirms the counted one")
            }
            Ok(Outcome::Conflict) => warn!(
                job = %v.job,
                lease = %v.lease,
                worker = %v.result.identity,
                "CONFLICT: a copy disagrees with the counted one; kept as evidence, another copy decides"
            ),
            Err(e) => {
                error!(job = %v.job, error = %e.chain(), "cannot apply a stored result")
            }
        }
        // A reporter that gave up waiting is not an error.
        let _ = req.reply.send(outcome);
    }
    // 5. Discredited workers and a grown selection: judge again what they
    // touched.
    rejudge(session, fallout).await?;
    if session.sched().is_complete() {
        session.complete.cancel();
    }
    Ok(())
}

/// Once every job is settled the run's result is final: copies that arrive
/// during the linger (a worker that was slow, or lying) are compared with the
/// recorded ones and kept as evidence, and change nothing else.
async fn keep_late_copies(
    session: &Session,
    group: &mut Vec<CommitRequest>,
) -> Result<()> {
    let mut batch = CommitBatch::new();
    let mut outcomes = Vec::with_capacity(group.len());
    blocking(|| -> Result<()> {
        for req in group.iter() {
            let v = &req.verified;
            let agrees = session
                .store
                .result(v.job)?
                .is_some_and(|recorded| recorded.agrees(&v.result));
            keep_copy(&mut batch, v.job, &v.result, agrees);
            outcomes.push(if agrees {
                Outcome::Confirmed
            } else {
                Outcome::Conflict
            });
        }
        Ok(())
    })?;
    apply_and_flush(session, batch).await?;
    let mut s = session.sched();
    for (req, outcome) in group.drain(..).zip(outcomes) {
        s.note_outcome(outcome);
        if outcome == Outcome::Conflict {
            warn!(job = %req.verified.job, worker = %req.verified.result.identity, "a copy that arrived after the run was complete disagrees; kept as evidence");
        }
        let _ = req.reply.send(Ok(outcome));
    }
    Ok(())
}

/// Writes a batch and flushes, with sled's synchronous writes kept off the
/// async threads.
async fn apply_and_flush(session: &Session, batch: CommitBatch) -> Result<()> {
    if !batch.is_empty() {
        let store = Arc::clone(&session.store);
        tokio::task::spawn_blocking(move || store.apply(batch)).await??;
    }
    session.store.flush_async().await?;
    Ok(())
}

/// Judges again every job that `fallout` may have unsettled: those a
/// discredited identity voted for (its unverified results now need a second
/// vote, and a banned identity's votes no longer count), and, when the
/// selection grew, settled jobs that are now selected. Repeats while judging
/// discredits more identities.
pub(crate) async fn rejudge(session: &Session, mut fallout: Fallout) -> Result<()> {
    for _round in 0..16 {
        if fallout.discredited.is_empty() && !fallout.selection_changed {
            return Ok(());
        }
        let mut jobs: Vec<JobId> = Vec::new();
        {
            let s = session.sched();
            for &id in &fallout.discredited {
                let (name, lost) = (s.identities().label(id), s.identities().lost(id));
                if s.identities().is_banned(id, s.policy().ban_after) {
                    error!(
                        worker = name,
                        lost,
                        "worker BANNED: it lost too many verification conflicts; its results are computed again by others"
                    );
                } else {
                    warn!(
                        worker = name,
                        lost,
                        "worker lost a verification conflict; each of its results now needs a second vote"
                    );
                }
            }
            if fallout.selection_changed {
                if s.second_source() {
                    info!(
                        share = s.policy().share(true),
                        "two machines are at work: checking that share of the jobs"
                    );
                } else {
                    info!(
                        "one machine is left at work: jobs stop waiting for checks it cannot give"
                    );
                }
                jobs.extend(s.unchecked_selected());
                jobs.extend(s.jobs_waiting_for_checks());
            }
        }
        if !fallout.discredited.is_empty() {
            // Their copies: the counted ones in the job records, the others
            // in the duplicates tree. A scan of the store, not of memory,
            // which holds no voter per job; discredits are rare.
            let names: Vec<String> = {
                let s = session.sched();
                fallout
                    .discredited
                    .iter()
                    .map(|&id| s.identities().name(id).to_owned())
                    .collect()
            };
            let store = Arc::clone(&session.store);
            let more = tokio::task::spawn_blocking(move || -> Result<Vec<JobId>> {
                let mut out = Vec::new();
                for entry in store.job_records() {
                    let (job, record) = entry?;
                    if let JobState::Done(r) = &record.state
                        && names.contains(&r.identity)
                    {
                        out.push(job);
                    }
                }
                for entry in store.duplicates() {
                    let (job, d) = entry?;
                    if names.contains(&d.result.identity) {
                        out.push(job);
                    }
                }
                Ok(out)
            })
            .await??;
            jobs.extend(more);
        }
        jobs.sort_unstable();
        jobs.dedup();
        let mut batch = CommitBatch::new();
        let mut settlements = Vec::with_capacity(jobs.len());
        for &job in &jobs {
            let mut jc = blocking(|| {
                JobCopies::load(session, job, session.store.job(job)?.work())
            })?;
            if jc.copies.is_empty() {
                continue;
            }
            let mut s = session.sched();
            let d = decide(
                &mut s,
                job,
                &mut jc,
                None,
                &mut batch,
                session.shape.solutions,
            );
            settlements.push(d.settlement);
        }
        apply_and_flush(session, batch).await?;
        fallout = Fallout::default();
        let mut s = session.sched();
        let mut reopened = 0;
        for st in &settlements {
            if !st.settled {
                reopened += 1;
            }
            let f = s.settle(st, false)?;
            fallout.discredited.extend(f.discredited);
            fallout.selection_changed |= f.selection_changed;
        }
        if reopened > 0 {
            info!(jobs = reopened, "jobs wait for another copy");
        }
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
        // Only the copy that is counted first stores its solutions; checks
        // are verified and counted, not stored (unless verification
        // overturned the copy whose solutions were stored).
        let write = session.sched().wants_solutions(job);
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
            let mut claims = self
                .session
                .claims
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            claims.remove(&self.job);
        }
    }
}

/// Rebuilds the verification state and the totals of a resumed run from its
/// stored copies: nothing cached is trusted. Every copy's tally is derived
/// again from its counts (and must equal the stored one, or the store is
/// damaged), lost conflicts are found again in the copies of disputed jobs,
/// and every job with copies is judged again and settled, or queued for
/// another copy.
///
/// # Errors
///
/// [`Error::DamagedResult`] when a stored tally does not match its counts;
/// store errors; [`Error::Inconsistent`] if the totals overflow.
pub(crate) fn restore(
    store: &nq_store::Store,
    shape: &nq_proto::convert::RunShape,
    sched: &mut Scheduler,
) -> Result<()> {
    // Streaming passes in job order, so that memory does not grow with the
    // run: the copies' machines (records and duplicates), the lost conflicts
    // (the jobs with duplicates), then every copy checked against its job's
    // definition and every job judged with the reputations found.
    let (mut confirmations, mut conflicts) = (0, 0);
    for entry in store.duplicates() {
        match entry?.1.kind {
            DuplicateKind::Confirmation => confirmations += 1,
            DuplicateKind::Conflict => conflicts += 1,
        }
    }
    let mut machines: Vec<String> = Vec::new();
    for_each_done(store, None, &mut |_, copies, _, _| {
        for c in copies.iter() {
            // The local threads are one machine.
            let m = if c.identity.starts_with("local:") {
                "local"
            } else {
                c.identity.as_str()
            };
            if !machines.iter().any(|x| x == m) && machines.len() < 2 {
                machines.push(m.to_owned());
            }
        }
        Ok(())
    })?;
    sched.restore_duplicates(confirmations, conflicts);
    // The selection as the previous session left it: two machines at work if
    // the stored copies came from two.
    sched.restore_two_machines(machines.len() >= 2);
    // Lost conflicts, from the disputed jobs that settled: only jobs with
    // duplicates can have any, so this pass reads just those.
    let mut dups = store.duplicates().peekable();
    while let Some(entry) = dups.next() {
        let (job, first) = entry?;
        let mut copies = vec![first.result];
        while let Some(Ok((j, _))) = dups.peek() {
            if *j != job {
                break;
            }
            if let Some(Ok((_, d))) = dups.next() {
                copies.push(d.result);
            }
        }
        // Duplicates exist only beside a Done record (as before, any other
        // is ignored).
        let JobState::Done(counted) = store.job_record(job)?.state else {
            continue;
        };
        copies.insert(0, *counted);
        let votes = votes_of(sched, &copies);
        let verdict = judge(
            &votes,
            sched.selected(job),
            &Default::default(),
            sched.rules(),
        );
        for loser in verdict.losers {
            sched.restore_loss(loser);
        }
        // Probation records, from the confirmations stored as duplicates.
        for confirmed in verdict.confirmed {
            sched.restore_confirmation(confirmed);
        }
    }
    // Check every copy, and judge every job with the reputations as they
    // stand.
    for_each_done(store, Some(shape), &mut |job, copies, attempts, work| {
        // Solutions mode: the stored solutions must be the recorded copy's.
        let stored = if shape.solutions {
            let n = usize::from(shape.board.n()).max(1);
            let mut rows = 0u64;
            for batch in store.job_solutions(job) {
                rows += (batch?.rows.len() / n) as u64;
            }
            (rows == copies[0].solutions).then_some(0)
        } else {
            Some(0)
        };
        let mut jc = JobCopies {
            copies: std::mem::take(copies),
            done: Some(0),
            counted: None,
            settled: false,
            attempts,
            work,
            stored,
        };
        let mut batch = CommitBatch::new();
        let mut d = decide(sched, job, &mut jc, None, &mut batch, shape.solutions);
        // The losses were charged in the first pass; the record is rewritten
        // by the next copy if the leader changed.
        d.settlement.losers.clear();
        d.settlement.confirmed.clear();
        sched.settle(&d.settlement, false)?;
        Ok(())
    })?;
    // Attempts of the jobs not done (the leased ones of the last session
    // are pending again).
    for entry in store.job_records() {
        let (job, record) = entry?;
        if !matches!(record.state, JobState::Done(_)) {
            sched.restore_attempts(job, record.attempts);
        }
    }
    Ok(())
}

/// The copies of `copies` as votes, in classes of equal results.
fn votes_of(sched: &mut Scheduler, copies: &[StoredResult]) -> Vec<Vote> {
    let mut reps: Vec<usize> = Vec::new();
    copies
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let class = reps
                .iter()
                .position(|&r| copies[r].agrees(c))
                .unwrap_or_else(|| {
                    reps.push(i);
                    reps.len() - 1
                });
            Vote {
                identity: sched.intern(&c.identity),
                class,
            }
        })
        .collect()
}

/// What [`for_each_done`] calls per job: its id, copies, attempts and work.
type DoneJobVisitor<'a> =
    dyn FnMut(JobId, &mut Vec<StoredResult>, u32, u64) -> Result<()> + 'a;

/// Calls `f` with every done job of the store, in job order: its copies (the
/// Done record's first, then the duplicates), its attempts and its work.
/// With the run's `shape`, each job's definition is read too: every copy's
/// tally is first derived again from its counts and must equal the stored
/// one. Without it the definitions are not read, and the work passed is 0.
fn for_each_done(
    store: &nq_store::Store,
    shape: Option<&nq_proto::convert::RunShape>,
    f: &mut DoneJobVisitor<'_>,
) -> Result<()> {
    let mut jobs = shape.map(|_| store.stored_jobs());
    let mut dups = store.duplicates().peekable();
    for entry in store.job_records() {
        let (job, record) = entry?;
        let JobState::Done(result) = record.state else {
            continue;
        };
        let mut copies = vec![*result];
        loop {
            match dups.peek() {
                Some(Ok((j, _))) if *j < job => {
                    dups.next();
                }
                Some(Ok((j, _))) if *j == job => {
                    if let Some(Ok((_, d))) = dups.next() {
                        copies.push(d.result);
                    }
                }
                Some(Err(_)) => {
                    if let Some(Err(e)) = dups.next() {
                        return Err(e.into());
                    }
                }
                _ => break,
            }
        }
        let mut work = 0;
        if let (Some(shape), Some(jobs)) = (shape, jobs.as_mut()) {
            // The job's definition: the jobs iterator runs ahead to it.
            let stored = loop {
                match jobs.next() {
                    Some(Ok((id, stored))) if id == job => break stored,
                    Some(Ok((id, _))) if id < job => continue,
                    Some(Err(e)) => return Err(e.into()),
                    _ => return Err(Error::DamagedResult { job }),
                }
            };
            work = stored.work();
            let subs = crate::session::subproblems_in(&stored, shape, job)?;
            for c in &copies {
                let mut tally = Tally::default();
                for (sub, counts) in subs.iter().zip(&c.counts) {
                    tally
                        .add(sub, counts)
                        .map_err(|_| Error::DamagedResult { job })?;
                }
                if c.counts.len() != subs.len() || tally != c.tally {
                    return Err(Error::DamagedResult { job });
                }
            }
        }
        f(job, &mut copies, record.attempts, work)?;
    }
    Ok(())
}
